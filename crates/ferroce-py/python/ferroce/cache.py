"""The registered-buffer cache (neuray's ``IRDMA_context``).

A :class:`Context` is bound to one remote host: ``Context.connect(ContextConfig(...))`` on
both sides, one listening on the out-of-band address and the other dialling it. It hands out
registered buffers (:meth:`Context.write_memory`, :meth:`Context.read_memory`), sends one to
the remote host with :meth:`Context.flush`, and takes what the remote flushed with
:meth:`Context.receive`. A buffer given back (``release()``, a ``with`` block, garbage
collection) returns to the cache still registered, so registration is paid once per buffer.

neuray's return codes become exceptions: -1 is :class:`ferroce.InvalidArgument` and -2
:class:`ferroce.NotSupported`, each with ``seed_code`` set.
"""

from ._ferroce import Buffer, Context, ContextConfig, size_class

__all__ = ["Buffer", "Context", "ContextConfig", "size_class"]
