"""Discrete-event simulator of parallel training (pure Python, never imports torch).

Empty at this stage of the project: the simulator arrives with issue 3 (schedules, engine,
contention, memory, energy). Nothing here pretends to simulate yet.
"""
