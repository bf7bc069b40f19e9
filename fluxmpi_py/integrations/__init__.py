"""Integrations built on the layers below: the torch.distributed backend ``fluxmpi``
(``integrations.c10d``, registered when fluxmpi_py is imported) and the Horovod face
(``integrations.horovod``, imported by users as ``fluxmpi_py.horovod``)."""
