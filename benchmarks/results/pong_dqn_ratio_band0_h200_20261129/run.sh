# issue 30: the config with ratio_tolerance 0 on one H200 machine, 120 s, the replay ratio's 10-s windows
source .old_src/prep.sh   # now in /tmp/tj
uptime
timeout 170 python3 -u benchmarks/time_to_target.py configs/pong_dqn.yaml --modes distributed --seeds 54 \
  --set stop.target_return=18 --set stop.max_seconds=120 --out /tmp/t0 --runs /tmp/t0/runs 2>&1 | grep -v "^\s*$" | tail -8
uptime
python3 - <<'PY'
import glob, json
from tianji_dask.results.analysis import open_run
d = glob.glob("/tmp/t0/runs/*/distributed-seed54")[0]
ds = open_run(d)
r = ds.tianji.replay_ratio(10.0)
print("windows", [round(float(x), 1) for x in r.values])
i = int((ds.updates > 0).argmax())
print("env_fps median", float(ds.env_fps[i:].median()), "train_fps median", float(ds.train_fps[i:].median()),
      "throttled actor/learner", float(ds.throttled_actor_s[-1]), float(ds.throttled_learner_s[-1]),
      "return", float(ds.return_mean_100[-1]), "env_steps", int(ds.env_steps[-1]))
PY
mkdir -p $OUT/t0; cp /tmp/t0/runs/*/distributed-seed54/metrics.nc /tmp/t0/runs/*/distributed-seed54/episodes.nc /tmp/t0/runs/*/distributed-seed54/config.yaml /tmp/t0/time_to_target.json $OUT/t0/ 2>/dev/null; ls $OUT/t0
