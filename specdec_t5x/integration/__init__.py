"""The T5X integration layer: the T5X-facing model, inference runner, seqio tasks,
checkpoints and partitioning. Imports the algorithm layer, never research tooling."""
