# The paper's 780M setting (Section 5, Table 6): 24 layers, d 1536, 12 heads of 128, vocab 32768, context 2048,
# SSSL windows, on ClimbMix. 3.91e19 FLOPs: 7,809 steps of 1,048,576 tokens for the baseline, 7,998 for BoV.
#   python prepare_data.py --source=climbmix --train_tokens=9.3e9   # t1_r03, the longest 780M run, reads 8.79B
#   torchrun --standalone --nproc_per_node=8 train.py config/paper_780m.py --variant=bov
size = "paper_780m"
data_dir = "data/climbmix"
target_flops = 3.91e19
total_batch_tokens = 1048576  # 4 sequences x 2048 tokens x 128 accumulation steps on one GPU (x 16 on 8 GPUs)
device_batch_size = 4
weight_decay = 0.0597
warmup_iters = 40
eval_interval = 500
eval_tokens = 41_900_000      # as paper_135m.py
log_interval = 1
# The 135M rates x sqrt(2) for the doubled batch (nanochat's rule). With configure_optimizers' (1536 / 768)^-0.5
# width scaling of the AdamW rates this gives Table 6: Muon 0.0283, embedding 0.30, lm_head 0.008, scalars 0.707,
# and the tables Section 5's 0.15.
matrix_lr = 0.02 * 2 ** 0.5
embedding_lr = 0.30 * 2 ** 0.5
unembedding_lr = 0.008 * 2 ** 0.5
scalar_lr = 0.50 * 2 ** 0.5
table_lr = 0.15 * 2 ** 0.5
