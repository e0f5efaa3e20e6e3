"""Gluon Trainer integration: loss scaling, skip-on-overflow, unscale. (Stub: issue #3.)"""


def init_trainer(optimizer_or_trainer, **scaler_options):
    """Attach a dynamic loss scaler to a Gluon Trainer."""
    raise NotImplementedError("init_trainer lands with the loss-scaling issue (#3)")


def scale_loss(loss, optimizer_or_trainer):
    """Context manager yielding the loss (or list of losses) multiplied by the loss scale."""
    raise NotImplementedError("scale_loss lands with the loss-scaling issue (#3)")


def unscale(optimizer_or_trainer):
    """Divide the gradients by the loss scale once per step (before gradient clipping)."""
    raise NotImplementedError("unscale lands with the loss-scaling issue (#3)")
