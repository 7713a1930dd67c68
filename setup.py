"""Builds the optional compiled kernels: the record codec's (evq/domain/record_kernels.pyx), the
remoting frame's (evq/net/frame_kernels.pyx), the mmap store's append and index loops
(evq/backends/mmapfile/store_kernels.pyx), the broker's send lane
(evq/net/broker/send_lane.pyx) and the group-name check before every request's handler
(evq/net/broker/names_kernels.pyx), the connection's read path (evq/net/read_path.pyx), a
producer's single send (evq/client/send_kernels.pyx) and its message
(evq/domain/message_kernels.pyx); pyproject.toml holds everything else.

The extensions are optional: with no C compiler, or when compiling fails, the install still
succeeds and evq runs the pure-Python code (evq.domain.record, evq.net.protocol,
evq.backends.mmapfile.kernels, evq.net.broker.send, evq.net.broker.names, evq.net.transport,
evq.client.producer and evq.domain.message choose at import time).
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # a build without Cython (pyproject's build requires bring it): pure
    extensions = []
else:
    extensions = cythonize(
        [Extension("evq.domain.record_kernels", ["evq/domain/record_kernels.pyx"]),
         Extension("evq.net.frame_kernels", ["evq/net/frame_kernels.pyx"]),
         Extension("evq.backends.mmapfile.store_kernels",
                   ["evq/backends/mmapfile/store_kernels.pyx"]),
         Extension("evq.net.broker.send_lane", ["evq/net/broker/send_lane.pyx"]),
         Extension("evq.net.broker.names_kernels", ["evq/net/broker/names_kernels.pyx"]),
         Extension("evq.net.read_path", ["evq/net/read_path.pyx"]),
         Extension("evq.client.send_kernels", ["evq/client/send_kernels.pyx"]),
         Extension("evq.domain.message_kernels", ["evq/domain/message_kernels.pyx"])],
        compiler_directives={"language_level": "3"}, quiet=True)
    for extension in extensions:
        extension.optional = True  # set after cythonize, which drops the flag

setup(ext_modules=extensions)
