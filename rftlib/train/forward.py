"""Re-export of :mod:`rftlib.models.forward` (the policy forward moved beside the models it runs), for
older imports. Patch ``rftlib.models.forward`` (the module that runs), not this one."""

from rftlib.models.forward import PolicyForward, completion_logprobs

__all__ = ["PolicyForward", "completion_logprobs"]
