"""`python -m specdec_t5x.infer`: the stable entry point of the inference runner
(specdec_t5x.integration.infer; run it with T5X's flags and the same gin files)."""
if __name__ == '__main__':  # the command line: TensorFlow's start-up lines left out (console.py)
  from specdec_t5x.integration import console
  with console.quiet_start():
    from specdec_t5x.integration.infer import infer, main
else:
  from specdec_t5x.integration.infer import infer, main

__all__ = ['infer', 'main']

if __name__ == '__main__':
  main()
