
import time as _time

PROCESS_T0 = _time.time()  # when this process loaded sao_jax: restart -> first update timing
