"""The data's lifecycle: forgetting a person, keeping history only as allowed, migrating.

``forget.py`` erases a person from every layer; ``retention.py`` keeps nights by the business's
rules; ``migrate.py`` brings an earlier layout up to date; ``upkeep.py`` finishes what a crash
left of them before a command goes on.

Invariant: each changes committed nights only through ``LandingZone.rewrite_night`` and
``remove_night``, and fails closed (one line, non-zero) when its promise cannot be kept.
"""
