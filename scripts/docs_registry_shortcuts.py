"""A griffe extension for the API pages: the pipelines' ``enable_<method>()`` shortcuts.

Every shortcut (the library's five and a plug-in's) is generated from the registry of methods when the package is
imported, so reading the source finds none of them; this extension imports the mixin's module and adds the generated
functions (their signatures and docstrings) to the statically loaded class.
"""

import griffe

MIXIN = "diffusers_var_accel.pipelines.acceleration_mixin.VARAccelerationMixin"


class RegistryShortcuts(griffe.Extension):
    def on_class_members(self, *, cls, **kwargs) -> None:
        if cls.path != MIXIN:
            return
        module_path, _, class_name = MIXIN.rpartition(".")
        inspected = griffe.inspect(module_path)
        for name, member in inspected[class_name].members.items():
            if name.startswith("enable_") and name not in cls.members:
                cls.set_member(name, member)
