def resolve_advantage(cfg): return None
