"""Commands run in kernels: ``execInKernel`` (run to the end, output returned) and ``kernelExec`` (output streamed).

Bytes: a kernel's output is bytes, not text. Each output is given twice: as text (UTF-8, every byte sequence that is not
valid UTF-8 replaced by U+FFFD, so the text is never silently wrong, only visibly marked) and as base64 of the exact
bytes (``stdoutBase64``...). Stdin is given as text (sent as UTF-8) or as base64 of exact bytes.
"""
