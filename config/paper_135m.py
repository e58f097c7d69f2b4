# The paper's 135M setting (Section 3, Table 6): 12 layers, d 768, 6 heads of 128, vocab 32768, context 2048,
# SSSL windows, on ClimbMix. 1.5e18 FLOPs: 3,766 steps of 524,288 tokens for the baseline, 3,838 for BoV.
# The learning rates are train.py's defaults (Table 6's 135M column).
#   python prepare_data.py --source=climbmix             # 2.2e9 train + 41.9e6 val tokens, BPE 32768
#   python train.py config/paper_135m.py --variant=bov   # or baseline, t1_r01 .. t1_r13, bov_shared_table, ...
#   torchrun --standalone --nproc_per_node=4 train.py config/paper_135m.py --variant=bov
size = "paper_135m"
data_dir = "data/climbmix"
target_flops = 1.5e18
total_batch_tokens = 524288   # 16 sequences x 2048 tokens x 16 accumulation steps on one GPU (x 4 on 4 GPUs)
device_batch_size = 16
weight_decay = 0.28
warmup_iters = 40
eval_interval = 500
eval_tokens = 41_900_000      # the paper's held-out split (~41.9M tokens): 20,458 rows of 2,048
log_interval = 1
