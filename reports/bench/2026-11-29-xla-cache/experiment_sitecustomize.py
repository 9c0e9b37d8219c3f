import os
if os.environ.get("EXP_JCC"):
    from jax._src import cache_key
    cache_key.xla_flags_to_exclude_from_cache_key.append("--xla_mosaic_dump_to")
    import jax
    jax.config.update("jax_compilation_cache_dir", os.environ["EXP_JCC"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    import atexit
    from jax._src import monitoring
    ev = {}
    def rec(e, *a, **k):
        if "compilation_cache" in e: ev[e] = ev.get(e, 0) + 1
    def recd(e, d, *a, **k):
        if "compilation_cache" in e: ev[e] = ev.get(e, 0) + d
    monitoring.register_event_listener(rec)
    monitoring.register_event_duration_secs_listener(recd)
    import json
    atexit.register(lambda: open(os.environ["EXP_JCC"] + ".log", "a").write(json.dumps({"pid": os.getpid(), **ev}) + "\n"))
