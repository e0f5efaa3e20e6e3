"""Op lists for the float16 target (GPU). STARTER DATA: to be completed to cover every op."""
TARGET = "float16"

LOW_PRECISION = {
    "Convolution": "", "Deconvolution": "", "FullyConnected": "", "RNN": "",
    "dot": "", "batch_dot": "", "_linalg_gemm": "", "_linalg_gemm2": "",
    "_npi_matmul": "", "_npi_einsum": "",
    "_contrib_interleaved_matmul_selfatt_qk": "", "_contrib_interleaved_matmul_selfatt_valatt": "",
    "_contrib_interleaved_matmul_encdec_qk": "", "_contrib_interleaved_matmul_encdec_valatt": "",
}
FP32 = {
    "softmax": "", "log_softmax": "", "sum": "", "mean": "", "exp": "", "log": "", "norm": "",
    "SoftmaxOutput": "", "LayerNorm": "", "_npi_exp": "", "_np_sum": "", "_npx_softmax": "",
    "_npx_log_softmax": "",
}
WIDEST = {"Concat": "", "stack": "", "add_n": "", "broadcast_add": "", "elemwise_add": "",
          "broadcast_mul": "", "elemwise_mul": "", "_npi_add": "", "_npi_multiply": "",
          "where": "", "_npi_concatenate": "", "_npi_stack": ""}
NEUTRAL = {"Activation": "", "relu": "", "Pooling": "", "BatchNorm": "", "Flatten": "",
           "Reshape": "", "Dropout": "", "_plus_scalar": "", "_mul_scalar": "",
           "_zeros": "", "_ones": "", "_arange": "", "_random_uniform": "", "_random_normal": "",
           "transpose": "", "slice": "", "Cast": "", "amp_cast": "", "amp_multicast": "",
           "_npi_relu": "", "_npx_relu": "", "_np_reshape": "", "_npi_zeros": "",
           "_npx_reshape": "", "_npi_add_scalar": "", "_npi_multiply_scalar": "",
           "_npx_activation": "", "_npx_pooling": "", "_npx_batch_norm": "",
           "_npx_dropout": "", "_np_transpose": "", "expand_dims": "", "zeros_like": "",
           "ones_like": ""}
CONDITIONAL_FP32 = {"Activation": ("act_type", ["softrelu"], "softrelu overflows in float16")}
LOSS_OUTPUT = {"SoftmaxOutput": "", "LinearRegressionOutput": "", "LogisticRegressionOutput": "",
               "MAERegressionOutput": ""}
FP32_PARAMS = {}
NO_CPU_KERNEL = {"Convolution": "", "Deconvolution": "", "FullyConnected": "", "RNN": "",
                 "dot": "", "batch_dot": "", "_linalg_gemm": "", "_linalg_gemm2": "",
                 "_npi_matmul": "", "_npi_einsum": "",
                 "_contrib_interleaved_matmul_selfatt_qk": "",
                 "_contrib_interleaved_matmul_selfatt_valatt": "",
                 "_contrib_interleaved_matmul_encdec_qk": "",
                 "_contrib_interleaved_matmul_encdec_valatt": ""}
