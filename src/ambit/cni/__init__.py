"""The CNI side of the node agent: the ``ambit-cni`` plugin, its installer, and ambient pod selection.

The plugin is exec'd by the container runtime for every pod sandbox, so everything it imports
(:mod:`ambit.cni.plugin`, :mod:`ambit.cni.selection`, :mod:`ambit.cni.errors`, :mod:`ambit.cni.kubeapi`,
:mod:`ambit.cni.agent_client`) is stdlib-only and imports its heavier stdlib modules lazily. This package
``__init__`` therefore imports nothing.
"""
