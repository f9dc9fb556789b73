"""The generic pieces every algorithm's roles are built from: the actor base (parameter
versions, heartbeats, env lifecycle), parameter publishing, the replay memories (flat and
Atari frame-deduplicated) and the n-step window. Each algorithm's own roles live in its folder
under :mod:`tianji_dask.algos`; :func:`tianji_dask.algos.registry.spec_for` picks them.
"""
