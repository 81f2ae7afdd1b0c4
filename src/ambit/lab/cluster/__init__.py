"""The lab as a whole: ``ambit lab up`` and ``down`` (:mod:`.lifecycle`), the crash-safe record of what it created
(:mod:`.record`), the long-running node and controllers processes ``lab up`` starts (:mod:`.node`), nodes joining
and leaving (:mod:`.join`, :mod:`.leave`), and ``ambit lab restart``'s rollouts of the installed mesh
(:mod:`.rollout`, :mod:`.restart`).
"""
