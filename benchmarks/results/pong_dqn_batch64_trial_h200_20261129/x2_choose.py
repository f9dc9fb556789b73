"""Pick the batch-64 trial that reached 18 first (or none: batch 32 stays) and write the choice
into configs/pong_dqn.yaml and configs/pong_dqn_apex.yaml in the working copy."""

import json
import math
import re
import sys
from pathlib import Path

X = Path(sys.argv[1])
best = None
for name, lr in (("trial_lr141", "0.000141421"), ("trial_lr100", "0.0001")):
    try:
        r = json.loads((X / name / "time_to_target.json").read_text())["runs"][0]
    except Exception as exc:  # noqa: BLE001
        print(name, "no result", exc)
        continue
    t = r["time_to_target_s"]
    print(name, "time_to_target_s", t, "env_steps", r["env_steps"], "return", r["return_mean_100"], "wall", r["wall_s"])
    if t is not None and not math.isnan(t) and (best is None or t < best[0]):
        best = (t, name, lr)
if best is None:
    print("choice: batch 32 (no batch-64 trial reached 18)")
    sys.exit(0)
print("choice:", best[1])
sets = {"batch_size": "64", "train_freq": "2", "buffer_size": "100000", "target_update_interval": "500", "lr": best[2]}
for path in (Path("configs/pong_dqn.yaml"), Path("configs/pong_dqn_apex.yaml")):
    text = path.read_text()
    for key, value in sets.items():
        text, n = re.subn(rf"^(  {key}: )\S+", rf"\g<1>{value}", text, count=1, flags=re.M)
        assert n == 1, (path, key)
    text, n = re.subn(r"^(  actors: )\S+", r"\g<1>5", text, count=1, flags=re.M)
    assert n == 1, (path, "actors")
    path.write_text(text)
    (X / "configs").mkdir(exist_ok=True)
    (X / "configs" / path.name).write_text(text)
