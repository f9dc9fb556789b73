"""The owned tcp:// transport: on a plain tcp:// comm both ends take the socket from tornado after
the handshake (:mod:`.owned_socket`) and move the queue's messages on threads of their own. The
inbox reads every sender on its receive loop and writes each one's credit from a thread
(:mod:`.receiving`); the sender writes its items from one thread and reads its credit on another
(``queue_sender.SenderThreads``). tls:// comms stay on the event loop
(:mod:`~tianji_dask.channels.comm_stream`)."""
