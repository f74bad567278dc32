#SBATCH -N2
srun ft-launcher train.py
