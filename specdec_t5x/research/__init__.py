"""Research tooling: training the demo family, evaluation, benchmarks, corpus building,
reference decoders and the paper's tables. Imports the layers below it."""
