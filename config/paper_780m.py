# The paper's 780M setting (its Section 5 and Table 6): 24 layers, d 1536, 12 heads of 128, vocab 32768,
# context 2048, SSSL windows; ClimbMix; 3.91e19 FLOPs = 7,809 steps of 1,048,576 tokens for the baseline,
# 7,998 for BoV (8.19B vs 8.39B tokens). The learning rates of Table 6 come from train.py's SIZE_DEFAULTS.
#   python prepare_data.py --source=climbmix --train_tokens=9.3e9  # the 780M runs of Table 2, t1_r03 the longest (8.79B tokens)
#   torchrun --standalone --nproc_per_node=8 train.py config/paper_780m.py --variant=bov
size = "paper_780m"
data_dir = "data/climbmix"
target_flops = 3.91e19
total_batch_tokens = 1048576  # 4 sequences x 2048 tokens x 128 accumulation steps on one GPU (x 16 on 8 GPUs)
device_batch_size = 4
eval_interval = 500
eval_tokens = 41_900_000      # as paper_135m.py: the size of the paper's held-out split
