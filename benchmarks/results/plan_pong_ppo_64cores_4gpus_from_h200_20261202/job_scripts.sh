# ---- tianji-run-g0-group
#!/usr/bin/env bash

#SBATCH -J tianji-run-g0-group
#SBATCH -n 1
#SBATCH --cpus-per-task=15
#SBATCH --mem=2G
#SBATCH -t 01:00:00
#SBATCH --gres=gpu:1

python3 -m distributed.cli.dask_worker tcp://<scheduler-address>:8786 --name tianji-run-g0-group --nthreads 7 --memory-limit 768.00MiB --nworkers 2 --nanny --death-timeout 60 --resources tianji_learner=1,tianji_actor=1,tianji_group_0=1

# ---- tianji-run-g1-group
#!/usr/bin/env bash

#SBATCH -J tianji-run-g1-group
#SBATCH -n 1
#SBATCH --cpus-per-task=15
#SBATCH --mem=2G
#SBATCH -t 01:00:00
#SBATCH --gres=gpu:1

python3 -m distributed.cli.dask_worker tcp://<scheduler-address>:8786 --name tianji-run-g1-group --nthreads 7 --memory-limit 768.00MiB --nworkers 2 --nanny --death-timeout 60 --resources tianji_learner=1,tianji_actor=1,tianji_group_1=1

# ---- tianji-run-g2-group
#!/usr/bin/env bash

#SBATCH -J tianji-run-g2-group
#SBATCH -n 1
#SBATCH --cpus-per-task=15
#SBATCH --mem=2G
#SBATCH -t 01:00:00
#SBATCH --gres=gpu:1

python3 -m distributed.cli.dask_worker tcp://<scheduler-address>:8786 --name tianji-run-g2-group --nthreads 7 --memory-limit 768.00MiB --nworkers 2 --nanny --death-timeout 60 --resources tianji_learner=1,tianji_actor=1,tianji_group_2=1

# ---- tianji-run-g3-group
#!/usr/bin/env bash

#SBATCH -J tianji-run-g3-group
#SBATCH -n 1
#SBATCH --cpus-per-task=15
#SBATCH --mem=2G
#SBATCH -t 01:00:00
#SBATCH --gres=gpu:1

python3 -m distributed.cli.dask_worker tcp://<scheduler-address>:8786 --name tianji-run-g3-group --nthreads 7 --memory-limit 768.00MiB --nworkers 2 --nanny --death-timeout 60 --resources tianji_learner=1,tianji_actor=1,tianji_group_3=1

