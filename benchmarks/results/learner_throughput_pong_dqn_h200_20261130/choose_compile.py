"""Exit 0 when the compiled variant's median samples/s beats the base's by 5 % or more."""

import json
import sys
from pathlib import Path

r = json.loads(Path(sys.argv[1]).read_text())
(res,) = r["results"].values()
med = res["median"]
ratio = med["compiled"] / med["base"]
print(f"median base {med['base']:.0f} compiled {med['compiled']:.0f} ratio {ratio:.3f}")
sys.exit(0 if ratio >= 1.05 else 1)
