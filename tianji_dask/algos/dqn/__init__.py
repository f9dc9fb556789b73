"""Double DQN (Ape-X style n-step transitions), its roles and its spec."""
