"""What a loop is, independent of where it runs: kernels, their analysis, parallel loops.

* :mod:`.kernel`: a user kernel, its source, its constants;
* :mod:`.analysis`: backend-neutral static checks of a kernel;
* :mod:`.loop`: a recorded parallel loop and its checks.
"""
