export NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
rm -rf /tmp/tj && mkdir /tmp/tj && cp -r tianji_dask configs benchmarks tests jobqueue pyproject.toml .old_src /tmp/tj/ && { [ -d .ipr ] && cp -r .ipr /tmp/tj/ || true; } && cd /tmp/tj
export PYTHONPATH=/tmp/site:/tmp/tj
