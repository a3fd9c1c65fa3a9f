"""Search over 4D plans with the simulator as cost function (never imports torch).

Empty at this stage of the project: the tuner arrives with issue 6.
"""
