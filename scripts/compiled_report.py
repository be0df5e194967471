"""The paper's Table 2 predicted from XLA's compiled programs: no accelerator, no weights.

  python scripts/compiled_report.py          # T5 v1.1 small/base/large/XXL, 1 and 8 devices
  python scripts/compiled_report.py --tiny   # tiny shapes in seconds (tests/test_compiled_report.py)

Traces each size from abstract shapes (bfloat16, the paper's 512 input / 256 output
tokens), compiles its prefill and decoder-step programs for 1 device and for 8-way model
parallelism on 8 fake host devices (this script adds
--xla_force_host_platform_device_count=8 to XLA_FLAGS before JAX starts), and writes
results/compiled_table2.{json,md} (--tiny: /tmp/compiled_report_tiny.*): XLA's cost and
memory analyses per program, roofline call times for TPU v4 and H200, c and
t_verify / t_step for each paper pair, the 12 rows' predicted speedups beside the paper's
and per-device memory at batch 1 and 32 (specdec_t5x/research/predict/compiled_costs.py). The
full run compiles 22 programs (a few minutes on 2 CPU cores).
"""

import os
import sys

# Before JAX starts: 8 host devices, and no LLVM optimisation of CPU code that is analysed,
# never run (the HLO that XLA's cost analysis reads is the same; compiles take half as long).
for _flag in ('--xla_force_host_platform_device_count=8', '--xla_backend_optimization_level=0'):
  if _flag.split('=')[0] not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()

from specdec_t5x.research.predict import (compiled_costs, compiled_tables,  # noqa: E402
                                          compiled_trees)
from specdec_t5x.research.results import harness


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  ap = harness.parser(__doc__, '')
  ap.add_argument('--tiny', action='store_true', help='tiny shapes: a CPU smoke run')
  ap.add_argument('--trees', default=compiled_trees.SOURCES,
                  help='tree results files (comma-separated) whose decodes are predicted at '
                       'the paper\'s sizes (research/predict/compiled_trees.py; empty: none)')
  args = ap.parse_args(argv)
  out = args.out or ('/tmp/compiled_report_tiny' if args.tiny else
                     harness.results_path(__file__, 'compiled_table2'))
  report = harness.Report(__file__, args, argv, out=out,
                          xla_flags=os.environ.get('XLA_FLAGS'))
  trees = compiled_trees.load(args.trees) if args.trees else None
  report.data.update(compiled_costs.run(tiny=args.tiny, trees=trees))
  print(report.write(compiled_tables.render(report)))
  return report.data


if __name__ == '__main__':
  main()
