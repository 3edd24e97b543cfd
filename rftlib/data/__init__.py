"""Tasks: a training pool, a disjoint held-out set, probes, a prompt and the task's own reward.

    base          Example, Task, the TASKS registry, build_task, registered_rewards
    arithmetic    the embedded default task (~50 lines: the model of a task)
    benchmarks    GSM8K / MATH / MATH-500 / HumanEval / MBPP loaders (cached or shipped files)
    prepare       the NuminaMath-style prepare pipeline (seed 003 sec. 8) and its 'prepared' task
    code_problems the code task, its sandboxed reward (registered as 'code_tests')
    curriculum    difficulty curricula and weighted task mixing (a task that brings its own sampler)
    jsonl         line-numbered jsonl loading

How to add a task (one place): a builder in its own module, ``@TASKS.register("name")`` on a function
returning ``Task(name, train, eval, reward=..., probes=...)``; a built-in one is declared instead, by
its builder's ``"module:attr"``, at the end of rftlib.data.base (imported when a config names it). Its
reward is any function (text, example, truncated) -> (float, diagnostics), best a registered one
(rftlib.rewards.registry) so a config can weigh it.
"""
