"""Op lists for the bfloat16 target (CPU, oneDNN). STARTER DATA: to be completed to cover every op."""
TARGET = "bfloat16"

LOW_PRECISION = {"Convolution": "", "FullyConnected": ""}
FP32 = {
    "softmax": "", "log_softmax": "", "sum": "", "mean": "", "exp": "", "log": "", "norm": "",
    "SoftmaxOutput": "", "LayerNorm": "", "dot": "", "batch_dot": "", "_npi_matmul": "", "Dropout": "no bf16 CPU kernel", "transpose": "2-D bf16 transpose corrupts the heap", "_npi_exp": "", "_np_sum": "", "_npx_softmax": "",
    "_npx_log_softmax": "",
}
WIDEST = {"Concat": "", "stack": "", "add_n": "", "broadcast_add": "", "elemwise_add": "",
          "broadcast_mul": "", "elemwise_mul": "", "_npi_add": "", "_npi_multiply": "",
          "where": "", "_npi_concatenate": "", "_npi_stack": ""}
NEUTRAL = {"Activation": "", "relu": "", "Pooling": "", "BatchNorm": "", "Flatten": "",
           "Reshape": "", "_plus_scalar": "", "_mul_scalar": "",
           "_zeros": "", "_ones": "", "_arange": "", "_random_uniform": "", "_random_normal": "",
           "slice": "", "Cast": "", "amp_cast": "", "amp_multicast": "",
           "_npi_relu": "", "_npx_relu": "", "_np_reshape": "", "_npi_zeros": "",
           "_npx_reshape": "", "_npi_add_scalar": "", "_npi_multiply_scalar": "",
           "_npx_activation": "", "_npx_pooling": "", "_npx_batch_norm": "",
           "_npx_dropout": "", "_np_transpose": "", "expand_dims": "", "zeros_like": "",
           "ones_like": ""}
CONDITIONAL_FP32 = {}
LOSS_OUTPUT = {"SoftmaxOutput": "", "LinearRegressionOutput": "", "LogisticRegressionOutput": "",
               "MAERegressionOutput": ""}
FP32_PARAMS = {}

NO_CPU_KERNEL = {}