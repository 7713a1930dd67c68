"""RocketMQ's plain ACL: signed requests checked against accounts in ``plain_acl.yml``.

Pure logic lives here (signatures, the account file's model, which resources a request
touches); the broker and the name server apply it in :mod:`evq.net`.
"""
