"""PPO (cleanrl's, on versioned rollouts), its roles and its spec."""
