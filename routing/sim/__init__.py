"""The trace simulator, used only by benches and their tests.

``trace`` loads the Mooncake conversation trace into block hashes; ``simulator``
replays it through a real Router against simulated replicas.
"""
