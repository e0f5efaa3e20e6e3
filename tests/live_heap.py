"""Source for child processes that count the C heap's live bytes (glibc's mallinfo).

A child's script starts with :data:`LIVE_HEAP_SOURCE`, which defines ``live_heap_mb()``: the
bytes the C heap has handed out and not had back, a count, unlike the resident size the
kernel reports. Read from /proc/self/statm, the temp-space test's growth was 160 MB with one
buffer and with four alike in the gVisor sandbox of an AMX Xeon (2026-11-27).
"""

LIVE_HEAP_SOURCE = """
import ctypes

FIELDS = 'arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost'.split()
libc = ctypes.CDLL('libc.so.6')
# glibc >= 2.33 has mallinfo2 (size_t fields); older ones only mallinfo (int fields, enough here)
if hasattr(libc, 'mallinfo2'):
    mallinfo, width = libc.mallinfo2, ctypes.c_size_t
else:
    mallinfo, width = libc.mallinfo, ctypes.c_int
mallinfo.restype = type('MallInfo', (ctypes.Structure,), {'_fields_': [(n, width) for n in FIELDS]})

def live_heap_mb():
    info = mallinfo()
    return (info.uordblks + info.hblkhd) / 2 ** 20
"""
