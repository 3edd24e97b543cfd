"""Environments: what the model talks to in a multi-turn rollout (issue 40), text in and text out.

    base          the interface (reset(example, seed) -> messages; step(assistant_text) -> Step(messages,
                  reward, done, info)), the ENVS registry (names -> "module:attr", imported on first use)
    single_turn   today's tasks as an environment: one completion, the task's reward
    calculator    a tool environment: Qwen2.5-format <tool_call>s to an arithmetic calculator that walks the
                  syntax tree (no exec, no eval), bounded; with python: true, a Python tool run in the sandbox;
                  errors returned as text and counted
    code_feedback the code task with retries: a failing program reads its first failing test and tries again,
                  the reward discounted per extra attempt
    chat          token-in, token-out: an environment's messages as the tokens to append after the model's stop
                  token (boundary tokens included), and the start-up check that refuses a chat template that
                  is not prefix-preserving
    trajectory    one episode's tokens: model tokens (mask 1, behaviour logprobs) and environment tokens (mask 0)

How to add an environment (one place): a class with ``reset`` and ``step`` (rftlib.envs.base gives the contract)
and ``ENVS.register("name", cls)``, or a declaration ``ENVS.declare("name", "package.module:Class")`` beside the
built-in ones at the end of rftlib.envs.base. Using them: docs/environments.md; the design: docs/design-multiturn.md.

Torch-free: importing this package imports the registry alone.
"""

import importlib

_WHERE = {"ENVS": "base", "Step": "base", "Environment": "base", "make_env": "base", "registered_envs": "base",
          "SingleTurnEnv": "single_turn", "CalculatorEnv": "calculator", "CodeFeedbackEnv": "code_feedback",
          "env_span": "chat",
          "check_prefix_preserving": "chat", "TemplateError": "chat", "Trajectory": "trajectory"}


def __getattr__(name: str):
    """The package's names, each imported from its module on first use."""
    if name not in _WHERE:
        raise AttributeError(f"module 'rftlib.envs' has no attribute '{name}'")
    return getattr(importlib.import_module(f"rftlib.envs.{_WHERE[name]}"), name)


__all__ = sorted(_WHERE)
