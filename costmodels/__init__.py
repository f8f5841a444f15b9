"""Cost models: what one iteration costs on a GPU. A catalog of GPUs and model shapes, the roofline
prior, and (from calibration) measured profiles."""
from costmodels.catalog import GPUS, MODELS, CatalogError, get_gpu, get_model
from costmodels.deployment import Deployment
from costmodels.profile import ProfileCostModel
from costmodels.selection import cost_model, load_cost_model
from costmodels.roofline import Efficiencies, RooflineCostModel, activation_reserve_bytes, weight_bytes

__all__ = ["GPUS", "MODELS", "CatalogError", "get_gpu", "get_model", "Deployment", "Efficiencies", "RooflineCostModel",
           "activation_reserve_bytes", "weight_bytes", "load_cost_model", "cost_model", "ProfileCostModel"]
