"""Speculative decoding: proposals (n-gram prompt lookup or a draft model) verified by
the target model inside the continuous batch. ``speculator.Speculator`` is the engine's
entry point; ``options.parse_speculative`` reads ``ENGINE_SPECULATIVE``."""
