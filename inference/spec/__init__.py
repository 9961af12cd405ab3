"""Speculative decoding: proposals (n-gram prompt lookup or a draft model) verified by
the target model inside the continuous batch. ``speculator.Speculator`` is the engine's
entry point; ``chatsite.speculative_setting`` reads ``ENGINE_SPECULATIVE``."""
