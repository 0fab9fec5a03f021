"""Offline converter: source cubes (.mat, ENVI, GeoTIFF, HDF5, .npy) to hsgds stores (format v1)."""
