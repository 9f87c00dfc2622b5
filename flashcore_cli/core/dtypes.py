"""The element types of q, k, v (and the output), by the names the registry's `dtypes:`, --dtype and the run
records use. The order of DTYPES is the bit order of the dtype mask a kernel declares (builder/ptxas.py)."""

DTYPES = ("fp16", "bf16")
DEFAULT_DTYPE = "fp16"  # a case, a run or a variant that names none; records from before bf16 were fp16
TORCH_NAMES = {"fp16": "float16", "bf16": "bfloat16"}  # the torch.<name> of each
ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16"}  # torch's spellings, which --dtype accepts too
