"""The OFU validation study: OFU against measured MFU, Nsight Compute's counts, the SM-clock check.

An application of the product maths in ``ofu/``, run by ``kernelfleet bench ofu-report`` on files a
GPU recorded (docs/validation/ofu.md): ``mfu`` (Table II), ``ncu`` (the sweep under Nsight
Compute), ``clock_check`` (the SM clock three ways), ``sampling`` (how many clock reads a window
needs), ``timeline`` (a loop's work inside a window); ``files`` reads the recorded folders,
``report`` turns them into rows and ``markdown`` prints the rows.
"""
