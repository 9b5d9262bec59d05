"""The LoRA rank study of the "Efficient Attention" report, offline on the 8x8 digits.

A base MLP trained on plain digits; then, for each transformed variant, full
fine-tuning, LoRA fine-tuning of the frozen base at each rank, and LoRA-only
training of a random frozen base. Run it, then tabulate:

    python -m train.sweep --sweep=sweeps/lora_digits.py --root=runs/lora_digits run
    python -m benchmarks.lora_table --root=runs/lora_digits --out=benchmark_results/lora_digits
"""

from configs import lora_base


def get_sweep():
  return dict(runs=lora_base.study_runs('digits'))
