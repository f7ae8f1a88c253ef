"""Colibri: Hugging Face transformer checkpoints to verified, model-specific C firmware.

The pipeline stages are modules of this package, in the order data flows through them:
model.load_model -> quantize -> plan -> emit (+ image) -> SCons build -> runner -> protocol -> reference/verify.
"""

__version__ = "0.1.0"
