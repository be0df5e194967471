"""The demo tasks' input prefixes (T5's), by demo task name: the one table that the seqio
tasks (tasks.py), the corpus and the evaluation read, here so that reading it imports
neither seqio nor TensorFlow."""

TRANSLATE_PREFIX = 'translate English to German: '  # T5's translate(en -> de).
SUMMARIZE_PREFIX = 'summarize: '  # T5's summarize: join(['summarize:', article], ' ').
PREFIXES = {'ende': TRANSLATE_PREFIX, 'summarize': SUMMARIZE_PREFIX}  # by demo task name
