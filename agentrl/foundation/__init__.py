"""Floor 1, the foundation: types and helpers every floor shares (errors, configs, atomic files, the
sampled record); these modules import no agentrl module outside this folder."""
