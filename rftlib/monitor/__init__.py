"""What a run writes and how it is judged while it runs.

    metrics    MetricsLogger: logs/metrics.jsonl, samples, spike log (+ trackers); read_metrics
    health     the verdicts (seed 003 sec. 12 smoke tests, early stopping) the live panel and report show
    trackers   tensorboard / wandb / mlflow / trackio behind the TRACKERS registry (offline stores)
    quiet      quiet_libraries: library warnings and loading bars into logs/library_warnings.log
"""
