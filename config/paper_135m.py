# The paper's 135M setting (its Section 3 and Table 6): 12 layers, d 768, 6 heads of 128, vocab 32768,
# context 2048, SSSL windows; ClimbMix; 1.5e18 FLOPs = 3,766 steps of 524,288 tokens for the baseline.
#   python prepare_data.py --source=climbmix             # 2.2e9 train + 41.9e6 val tokens, BPE 32768
#   python train.py config/paper_135m.py --variant=bov   # or baseline, t1_r01 .. t1_r13, bov_shared_table, ...
#   torchrun --standalone --nproc_per_node=4 train.py config/paper_135m.py --variant=bov
size = "paper_135m"
data_dir = "data/climbmix"
target_flops = 1.5e18
total_batch_tokens = 524288   # 16 sequences x 2048 tokens x 16 accumulation steps on one GPU (x 4 on 4 GPUs)
device_batch_size = 16
eval_interval = 500
eval_tokens = 41_900_000      # the size of the paper's held-out split (~41.9M tokens): 20,458 rows of 2,048 of prepare_data.py's val
