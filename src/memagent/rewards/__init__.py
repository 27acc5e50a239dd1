"""Rewards as plug-ins (docs/rewards.md): the `Reward` protocol (`protocol`), the registry of built-ins and the
`memagent.rewards` entry-point group (`registry`), the step rewards from gold evidence (`step`) and the judge
(`judge`)."""
