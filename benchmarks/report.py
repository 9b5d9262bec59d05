r"""Experiment workdirs -> one comparison table and learning-curve plots.

Reads each workdir's `results.json` (written when a run finishes),
`metrics.jsonl` (one JSON object per log/eval: step, split, loss, accuracy,
top5_accuracy, ...) and `config.json`. A run without results.json is reported
from its last logged metrics, marked 'running'. Directories that are not workdirs are
skipped with a message, so a glob over a sweep root works. Workdirs may be on gs://
(quote the glob there, the shell cannot expand it: 'gs://bucket/runs/*').

    python -m benchmarks.report runs/* --out=benchmark_results/report
    python -m benchmarks.report runs/mnist_* --sort=eval_accuracy --name=mnist

Runs whose configs differ only in `train.seed` are also summarised over seeds:
the mean eval accuracy, its spread (half the range), the lowest and highest,
and the mean epoch time and ex/s of the finished runs of each group.

Speed, two quantities under two names:

  * 'ex/s' is the number the trainer prints as 'ex/s' on its last progress line
    (results.json `steady_examples_per_sec`): examples per second over every
    training step after the first (which compiles), evaluation, checkpoint
    saving and metric writing excluded;
  * 'epoch time' is the median time of a whole epoch after the first (the first
    when only one ran), the same excluded; results.json's `examples_per_sec` is
    examples per epoch / that time (the steady rate in a run shorter than an
    epoch). It is kept in the JSON rows, not shown as a column.

An earlier report's JSON may stand in for workdirs that are gone: its rows are
read as they were written (marked with their `source`), and they join the seed
groups. A report written before rows recorded their `config_id` cannot be
matched by config; the groups are then formed from what every row records
(model, dataset, mechanism, projection, heads, d_model, depth, steps, eval
split), and the table says so.

    python -m benchmarks.report old_report.json 'runs/seed1/*' --name=over_seeds

Writes <out>/<name>.json, .md and <name>_curves.png (loss and accuracy against
step, train solid and eval dashed, one colour per run; and eval accuracy over
the second half of each run, zoomed to its range).
"""

import os
from typing import Any, Dict, Optional, Sequence

from absl import flags
from etils import epath

from benchmarks import common
from benchmarks import machine
from benchmarks import output
from benchmarks import report_output
from benchmarks import report_rows


def define_flags(fv: flags.FlagValues) -> None:
  common.define_output_flags(fv, out='benchmark_results/report', name='report')
  flags.DEFINE_string('sort', '', 'column key to sort by (descending for accuracy)', flag_values=fv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  args, workdirs = common.parse_flags(define_flags, argv, __doc__, positional='workdirs')
  workdirs = [w for pattern in workdirs for w in report_rows.expand(pattern)]
  info = machine.device_info()
  rows = []
  for wd in workdirs:
    if wd.endswith('.json') and epath.Path(wd).is_file():
      rows += report_rows.from_report(wd)
      continue
    if not report_rows.is_workdir(wd):
      if not args.quiet:
        print(f'[report] skipping {wd}: no results.json or metrics.jsonl')
      continue
    rows.append(report_rows.summarise_run(wd))
  if not rows:
    raise SystemExit('no experiment workdirs or report JSON among: ' + ' '.join(workdirs))
  rows = report_rows.sort_rows(rows, args.sort)
  meta = dict(
    device=info,
    device_line=machine.describe_device(info),
    workdirs=workdirs,
    command=output.command('benchmarks.report', argv),
  )
  png = report_output.plot_curves(os.path.join(args.out, f'{args.name}_curves.png'), rows)
  groups, grouped_by = report_rows.seed_groups(rows)
  data = dict(
    meta=meta, runs=rows, seed_groups=groups, seed_groups_by=grouped_by, plots=[png] if png else []
  )
  output.finish(
    args.out,
    args.name,
    data,
    report_output.markdown(meta, rows, groups, grouped_by),
    quiet=args.quiet,
  )
  return data


if __name__ == '__main__':
  main()
