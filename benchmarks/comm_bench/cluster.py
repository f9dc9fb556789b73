"""The LocalCluster the Dask transports run on, and one method per transport that runs a case."""

from __future__ import annotations

import os
import time

import numpy as np

from tianji_dask.runtime.cluster.workers import scheduler_workers

from .cases import MB, Case, CommBenchConfig
from .workload import RssSampler

IDLE_PROBE_S = 2.0  # how long the idle workers' background CPU is measured at start-up


class BenchCluster:
    """A LocalCluster of 1 + max_actors single-threaded workers on 127.0.0.1: worker 0 receives,
    workers 1.. are the actors. No preload (torch is not imported), no dashboard."""

    def __init__(self, cfg: CommBenchConfig):
        self.cfg = cfg

    def __enter__(self):
        import dask
        from distributed import Client

        from tianji_dask.channels import ChannelPlugin
        from tianji_dask.runtime.cluster.cluster import local_cluster

        env = dict(self.cfg.worker_env)
        if self.cfg.unset_malloc_trim:
            env["MALLOC_TRIM_THRESHOLD_"] = None
        # The nannies read a variable from this process's environment before their config and
        # write their pre-spawn values into it (an earlier LocalCluster in this process may have
        # left MALLOC_TRIM_THRESHOLD_ here): clear what is to be unset, restore all on exit.
        self._environ = dict(os.environ)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
        self._cfgctx = dask.config.set({f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in env.items()})
        self._cfgctx.__enter__()
        n_workers = 1 + self.cfg.max_actors
        self.cluster = local_cluster(n_workers, dashboard=False, preload_roles=False)
        self.client = Client(self.cluster)
        self.client.wait_for_workers(n_workers, timeout=120)
        self.client.register_plugin(ChannelPlugin())
        self.workers = sorted(scheduler_workers(self.client))
        self.pids = self.client.run(os.getpid)
        # Dask's own background work (heartbeats, monitors, ticks) counts in T_sd and T_rv: measure it.
        cpu0 = self.client.run(time.process_time)
        time.sleep(IDLE_PROBE_S)
        cpu1 = self.client.run(time.process_time)
        self.idle_cpu_fraction = float(np.median([(cpu1[w] - cpu0[w]) / IDLE_PROBE_S for w in cpu0]))
        names = sorted({"MALLOC_TRIM_THRESHOLD_", *env})
        envs = self.client.run(lambda: {k: os.environ.get(k, "unset") for k in names})
        self.worker_env = {k: ",".join(sorted({e[k] for e in envs.values()})) for k in names}
        return self

    def __exit__(self, *exc):
        try:
            self.client.close()
            self.cluster.close()
        finally:
            self._cfgctx.__exit__(None, None, None)
            os.environ.clear()
            os.environ.update(self._environ)

    def _actor(self, cls, worker, *args):
        return self.client.submit(cls, *args, actor=True, workers=[worker], pure=False)

    def run_channel(self, case: Case, name: str) -> dict:
        from .hosts import ChannelCollector, ChannelProducer

        cfg, A = self.cfg, case.actors
        cap = int(cfg.capacity_mb * MB)
        recv_w, send_ws = self.workers[0], self.workers[1 : 1 + A]
        futs = [self._actor(ChannelCollector, recv_w, name, cap * A)]
        futs += [self._actor(ChannelProducer, w) for w in send_ws]
        try:
            coll, *prods = [f.result(timeout=60) for f in futs]
            address = coll.address().result(timeout=30)
            with RssSampler(self.pids[recv_w]) as rss:
                collected = coll.collect(case.messages, A, cfg.case_timeout_s)
                readies = [
                    p.prepare(address, name, f"actor-{i}", case.message_bytes, cfg.sample_mode, case.sample_time, cap)
                    for i, p in enumerate(prods)
                ]
                for r in readies:
                    r.result(timeout=90)
                start_at = time.monotonic() + 0.05 + 0.01 * A
                for g in [p.go(start_at) for p in prods]:
                    g.result(timeout=30)
                got = collected.result(timeout=cfg.case_timeout_s + 30)
                sent = [f.result(timeout=60) for f in [p.finish() for p in prods]]
                fin = coll.finish().result(timeout=60)
        finally:
            self.client.cancel(futs)
        n_sent = sum(s["sent"] for s in sent)
        return {
            "collection_time": got["t_n"] - min(s["t_first"] for s in sent),
            "messages_sent": n_sent,
            "t_sp": sum(s["sample_wall_s"] for s in sent) / n_sent,
            "t_sp_cpu": sum(s["sample_cpu_s"] for s in sent) / n_sent,
            "t_sd": sum(s["cpu_s"] - s["sample_cpu_s"] for s in sent) / n_sent,
            "t_rv": got["cpu_s"] / case.messages,
            "send_call_time": sum(s["push_wall_s"] - s["blocked_s"] for s in sent) / n_sent,
            "credit_wait_time": sum(s["blocked_s"] for s in sent) / n_sent,
            "items_per_wire_message": n_sent / max(1, sum(s["wire_messages"] for s in sent)),
            "inbox_max_queued": fin["max_queued_bytes"] / MB,
            "receiver_rss_start": rss.start_bytes / MB,
            "receiver_rss_peak": rss.peak_bytes / MB,
            **rss.per_message(case.messages),
        }

    def run_actor_calls(self, case: Case, name: str) -> dict:
        from .hosts import CallReceiver, CallSender

        futs = [self._actor(CallReceiver, self.workers[0]), self._actor(CallSender, self.workers[1])]
        try:
            recv, snd = [f.result(timeout=60) for f in futs]
            recv.start(case.messages).result(timeout=30)
            with RssSampler(self.pids[self.workers[0]]) as rss:
                s = snd.send(recv, case.messages, case.message_bytes).result(timeout=self.cfg.case_timeout_s)
                got = recv.wait(60).result(timeout=90)
        finally:
            self.client.cancel(futs)
        return self._simple(case, s, got, rss)

    def run_queue(self, case: Case, name: str) -> dict:
        from distributed import Queue

        from .hosts import QueueCollector, QueueProducer

        q = Queue(name, client=self.client, maxsize=16)  # created here first, so this maxsize holds
        futs = [self._actor(QueueCollector, self.workers[0]), self._actor(QueueProducer, self.workers[1])]
        try:
            coll, prod = [f.result(timeout=60) for f in futs]
            with RssSampler(self.pids[self.workers[0]]) as rss:
                collected = coll.collect(name, case.messages)
                s = prod.send(name, case.messages, case.message_bytes).result(timeout=self.cfg.case_timeout_s)
                got = collected.result(timeout=120)
        finally:
            self.client.cancel(futs)
            q.close()
        return self._simple(case, s, got, rss)

    @staticmethod
    def _simple(case: Case, s: dict, got: dict, rss: RssSampler) -> dict:
        return {
            "collection_time": got["t_n"] - s["t_first"],
            "messages_sent": s["sent"],
            "t_sp": 0.0,
            "t_sp_cpu": 0.0,
            "t_sd": s["cpu_s"] / s["sent"],
            "t_rv": got["cpu_s"] / case.messages,
            "receiver_rss_start": rss.start_bytes / MB,
            "receiver_rss_peak": rss.peak_bytes / MB,
            **rss.per_message(case.messages),
        }
