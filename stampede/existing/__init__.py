"""Checkpoints stampede did not write: what one holds, and who reads what of it.

`scan.scan(path)` reads only the headers of an existing checkpoint (a directory, or a single
file) and returns its `Catalogue`: the format, the data files, every tensor (or saved
byte range) with its dtype, shape, size and file offset. `assign.assign(catalogue, policy,
nranks, rank)` says which bytes one rank reads, as `stampede.checkpoint.plan.Extent`s, the way a
real loader splits the work. Both are pure apart from scan's reads: nothing is written
anywhere near the checkpoint (no manifest, no temporary file), and every file is opened
read-only.

Where scan reads: through the storage contract every run uses (stampede.backends): a
POSIX path (open O_RDONLY, pread), or a URL (s3://bucket/prefix, or one object's URL)
with only reading requests: one LIST of the prefix, a HEAD per file (its size), ranged
GETs of the headers and of the small files (DCP's .metadata; a stampede-manifest.json
that must not be there). HDF5 is read from POSIX paths only: h5py opens the file itself.

The modules: catalogue (what a scan returns, and the reads it makes), scan (finding the
checkpoint and its format), safetensors, dcp, hdf5 (one format each), assign (who reads
what).

Formats:
- safetensors: one `*.safetensors` file, or the shards a `*.safetensors.index.json`
  (Hugging Face's `weight_map`) names. Each file: 8 bytes (little-endian header length
  n), n bytes of JSON, then the data; parsed here with json alone.
- dcp (PyTorch Distributed Checkpoint): `.metadata` (a pickle of
  torch.distributed.checkpoint's `Metadata`) and the `__R_K.distcp` files saving rank R
  wrote. Unpickling needs torch, and only torch's checkpoint classes, sizes and dtypes
  are let out of the pickle. Each saved item (a tensor, one chunk of a sharded tensor, or
  a pickled object) is a byte range of one file, in torch's own serialisation: it is read
  whole or in byte slices, never decoded here.
- hdf5: `*.h5` / `*.hdf5` files written by h5py or libhdf5; every dataset, in groups at
  any depth (named with '/'), must be contiguous and unfiltered: stampede reads a
  dataset's bytes at its file offset, as a loader that maps or preads HDF5 data does.

Extents of safetensors and HDF5 tensors are relative to the tensor's first byte and name
the tensor, so the timed `header` op locates them (stampede.checkpoint.formats.parse_header); DCP
extents are raw file offsets (tensor ""). DCP's `.metadata` is never in an extent:
every rank reads it whole first (`Catalogue.index_file`), which the caller plans as the
shared index read.

Policies (`spec.ASSIGN_POLICIES`: files, tensor-slices, saved) are stampede.existing.assign's.
Under files and tensor-slices every tensor byte is read by exactly one rank; no extent is
empty (zero-byte tensors are catalogued but never read).
"""

