"""The generic pieces every algorithm's roles are built from: the loop protocols, the actor
base (parameter versions, heartbeats, env lifecycle), the buffer base and the off-policy
replay buffer role, parameter publishing, the n-step window and the replay memories (flat and
Atari frame-deduplicated). Each algorithm's own roles live in its folder under
:mod:`tianji_dask.algos`; :func:`tianji_dask.algos.registry.spec_for` picks them.
"""
