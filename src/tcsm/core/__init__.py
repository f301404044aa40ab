"""What every layer shares: the `Batch` a trainer hands an objective, the trainer's contract (`protocols`), the user
error types, the typed evaluation result (`results`) and progress reporting for long loops."""
